"""HTTP routes: thin functions over `service.manager`, `service.api.health` and the store."""

"""HTTP routes: thin functions over `service.manager`, `service.health` and the store."""

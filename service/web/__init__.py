"""The browser pages: sign-in, the list of one's sweeps, a sweep's live page and dashboard, the submit page, and
the API's docs pages; their templates, static files and security headers. Built on `service.api`'s auth,
sessions and limits; the app (`service.app`) mounts them beside the JSON API."""

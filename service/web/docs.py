"""The API's docs from this origin: Swagger UI at /docs (and its OAuth2 redirect page), ReDoc at /redoc.

Their scripts and styles are fastapi-offline's copies, which the app serves under /static-offline-docs/
(service/app.py), so the docs work on a machine that reaches no CDN. FastAPI's own builders make the
HTML; each page goes out with the browser pages' security headers (service/web/pages.py, PAGE_HEADERS)
and DOCS_CSP, which allows the page's inline script by its hash.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

from service.web.pages import DOCS_CSP, PAGE_HEADERS, csp_for

DOCS_URL, REDOC_URL = "/docs", "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
STATIC_URL = "/static-offline-docs"  # where fastapi-offline mounts its files (its default)

router = APIRouter(include_in_schema=False)


def _secured(page: HTMLResponse) -> HTMLResponse:
    html = bytes(page.body).decode()
    return HTMLResponse(html, headers=PAGE_HEADERS | {"Content-Security-Policy": csp_for(DOCS_CSP, html)})


@router.get(DOCS_URL)
async def swagger_ui(request: Request) -> HTMLResponse:
    app, root = request.app, request.scope.get("root_path", "")
    return _secured(
        get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            # no badge from swagger.io's online validator: it would send the schema's URL to another site
            swagger_ui_parameters=(app.swagger_ui_parameters or {}) | {"validatorUrl": None},
        )
    )


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_oauth2_redirect() -> HTMLResponse:
    return _secured(get_swagger_ui_oauth2_redirect_html())


@router.get(REDOC_URL)
async def redoc(request: Request) -> HTMLResponse:
    app, root = request.app, request.scope.get("root_path", "")
    return _secured(
        get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )
    )


__all__ = ["router"]

"""The web view of the live service: read-only pages over the job store, served by the service's own
application (:func:`pollux.cluster.api.app.create_app` mounts :func:`.routes.web_router`).

``routes.py`` holds the pages and the login; ``session.py`` who a request comes from (a cookie or a
bearer token); ``pages.py`` the view models of the tables; ``history.py`` a job's hints history as
points over time (also served by the API); ``charts.py`` the server-rendered SVG charts;
``logtail.py`` the tail of a job's log; ``templates/`` the Jinja2 templates and the style sheet. See
``docs/web.md``.
"""

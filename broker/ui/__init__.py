"""The operator UI (docs/ui.md): server-rendered pages under /ui/, behind the admin's staff
login."""

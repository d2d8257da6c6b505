"""The operator UI (SPEC §7): server-rendered pages under /ui/, behind the admin's staff login."""

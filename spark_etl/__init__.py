"""Delivery analytics and archival on PySpark (SPEC §8). Importable without Django."""

"""Revisions of the usage tables (loaded by Alembic from this folder; one module each)."""

"""Revisions of the registry tables (loaded by Alembic from this folder; one module each)."""

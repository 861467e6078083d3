"""Revisions of the batch tables (loaded by Alembic from this folder; one module each)."""

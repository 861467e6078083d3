"""The model registry in a SQL database (SQLAlchemy 2; SQLite locally, Postgres in production).
"""

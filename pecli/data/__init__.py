"""Datasets: named ones (local files in the shared layout, or the hub), a user's own files,
and the multiple-choice item files, all as rows in one schema with their provenance.

May import pecli.runs only.
"""

"""Batch: corpus reading, the pilot, the manifest, the Ray driver, status and reports.

``make pilot`` (:mod:`batch.pilot`) proves the path on 12 documents; ``make batch`` runs the
full corpus over Ray engine actors, resumable by manifest; ``make plan`` sizes the lots.
"""

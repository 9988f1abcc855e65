"""Submission: the front door of Trainyard.

Owns (schema ``submission``): teams, users and their hashed bearer tokens; every job as it
was submitted; and the job view users read (status history, placement, metrics,
checkpoints, the registered model and the cost), kept up to date from the platform's
lifecycle events.

Says: ``trainyard.job.submitted.v1`` (a job was accepted) and
``trainyard.job.cancel_requested.v1`` (a user asked to stop a job), both through the
transactional outbox. Listens to the scheduler's, runners', registry's and billing's
events about jobs (consumer ``submission``), and to the ``job.cancel_requested`` the
registry says on its behalf (``handlers``), never to its own.
"""

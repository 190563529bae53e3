"""What the daemon records: the journal of batches (SQLite, with its writer thread),
the audit trail, the metrics, and each user's memory and todo lists."""

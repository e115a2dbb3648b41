"""The studio's durable state: accepted work, video jobs and the History index, in one SQLite database."""

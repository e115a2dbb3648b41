"""The browser page: the Simple, Workflow, History and Queue tabs and their live views."""

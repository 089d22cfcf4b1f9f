"""What reads the JSON document: gates (``--fail-on``) and run comparisons (``compare``)."""

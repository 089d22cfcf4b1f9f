"""``nsysfrag record --try``: the program run under each allocator setting and compared with
its baseline and with what ``whatif`` predicted. ``settings`` (what may be tried, merged into
the program's PYTORCH_CUDA_ALLOC_CONF), ``rounds`` (the runs, each recorded as ``record``
records), ``measure`` (each run's figures, rank by rank), ``predict`` (``whatif`` on the
baseline), ``compare`` (the table's rows, the verdict, the ``nsysfrag-try/1`` document),
``terminal`` and ``html`` (its reports)."""

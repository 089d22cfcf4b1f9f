"""``nsysfrag record``: watch a PyTorch job live, per rank, without nsys or a change to it.

The command's Python processes load ``bootstrap/`` from ``PYTHONPATH``: its ``sitecustomize``
arms the recorder (``bootstrap/nsysfrag_recorder``, standard library and torch only, since the
program's interpreter may not have nsysfrag's dependencies), which does nothing until torch has
initialized CUDA. Here, on nsysfrag's side: ``layout`` (the record folder: what it holds and
how a later ``analyze`` finds each rank's snapshot; the device facts beside a snapshot are
read by the snapshot input, ``inputs.torch_snapshot.facts``), ``rating`` (a state snapshot rated exactly as ``analyze`` rates one),
``alerts`` (crossings of the health levels, said and sent), ``watch`` (the loop that rates each
rank's newest state while the command runs), ``launch`` (running the command), ``report``
(the sampled timeline in a rank's document and the terminal).
"""

"""Ordered training sends (docs/sequencer.md).

Job: the per-TrainingClient ordered sender (``sequencer``), settling one operation's future from
its chunks (``chunkgroup``) and the client-side custom loss of ``forward_backward_custom``
(``custom_loss``, needs torch, imported only when used). Invariants: the order in which threads
call a TrainingClient is the order its requests leave; an operation's future settles once, from
all its chunks. Imports: ``_runtime`` (``causes``), ``_futures``, ``_transport``, ``_wire``,
``types`` and ``exceptions`` (``training_client`` only for type checking); this ``__init__``
imports nothing.
"""

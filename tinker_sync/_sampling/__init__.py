"""One ``SamplingClient.sample()`` call's life, and the sessions of unpickled sampling clients.

Job: a sample's dispatch, polling, retries and settling (``job``), the sampling retry layer with
``RetryConfig`` (``retry``), and the shared shadow sessions and clone ids of unpickled or
handle-built clients (``handles``). Invariants: no lock is held across I/O; a sample's steps run
one at a time; sample futures do not survive a fork. Imports: ``_runtime``, ``_flow``,
``_polling``, ``_session``, ``_transport``, ``_wire``, ``_futures``, ``_config``, ``types`` and
``exceptions`` (``sampling_client`` only for type checking); this ``__init__`` imports nothing.
"""

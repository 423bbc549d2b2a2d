"""Wire formats of the Tinker protocol: pure functions, no I/O.

* ``_pbwire``: protobuf wire primitives (varints, field readers/writers, dtype tables).
* ``_proto``: the client's protobuf codecs (forward_backward request out, results in).
* ``_jsonresults``: the JSON forms of the results that older servers send.
* ``_zstd``: zstd request bodies (the client compresses; the local server inflates them).
* ``_chunking``: forward_backward chunk boundaries and per-datum byte estimates.
* ``_metrics``: chunk metric reduction and result combination.
* ``_estimates``: sampling prompt byte estimates.
* ``_headers``: header names of the protocol used by both the client and the local server.
* ``_converter``: the JSON (attrs/cattrs) converter of the public types.
* ``tinker_public_pb2``: the generated protobuf module (private descriptor pool).

The wire layer knows nothing of the local server (its codecs live in ``tinker_sync.local``)
nor of the clients. Import the submodules directly; this package imports nothing eagerly so that
``tinker_sync.types`` can use ``_wire._converter`` without a cycle.

Thread and fork safety: every function here is pure.
"""

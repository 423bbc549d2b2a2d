"""Wire formats of the Tinker protocol: pure functions, no I/O.

* ``_proto``: protobuf encoders/decoders (forward_backward request, results) and the JSON
  fallbacks of the results.
* ``_chunking``: forward_backward chunk boundaries and per-datum byte estimates.
* ``_metrics``: chunk metric reduction and result combination.
* ``_estimates``: sampling prompt byte estimates.
* ``_converter``: the JSON (attrs/cattrs) converter of the public types.
* ``tinker_public_pb2``: the generated protobuf module (private descriptor pool).

Import the submodules directly; this package imports nothing eagerly so that
``tinker_sync.types`` can use ``_wire._converter`` without a cycle.

Thread and fork safety: every function here is pure.
"""

"""The model as headprune reads it (the core's lowest layer; it imports nothing else of the core): the
config keys a pruned model carries (:mod:`.records`), the family table (:mod:`.families`, with the fused
layouts of :mod:`.layouts`), attention sites (:mod:`.sites`) and FFNs (:mod:`.ffn`), what a model keeps
(:mod:`.kept`), the modules a pruned model runs (:mod:`.runtime`), costs (:mod:`.cost`,
:mod:`.unit_cost`, :mod:`.kvcache`), and helpers that know a model only by its inputs, parameters or
calls (:mod:`.devices`, :mod:`.inputs`, :mod:`.calls`, :mod:`.finite`, :mod:`.chunked`)."""

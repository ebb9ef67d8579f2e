"""Models on disk, unverified (imports only the layers below): transformers' load report held to
(:mod:`.loading`), the pruned checkpoint's layout (:mod:`.checkpoint`), stock configs (:mod:`.stock`),
save and load (:mod:`.saving`), GGUF files read as a PyTorch model (:mod:`.gguf`), and transformers'
progress bars kept quiet meanwhile (:mod:`.quiet`)."""

"""The safety net (imports only the layers below): the trial of a cut on a shrunk copy of the model
(:mod:`.trial`), and the verdict every public function asks for before it cuts or loads
(:mod:`.verify`)."""

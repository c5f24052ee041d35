"""Loading the models speckv predicts with and reading their caches: the architecture facts a
predictor needs (``architecture``), caches built and taken apart (``cache``), weights read from
a checkpoint folder (``checkpoint``), and the embedded demo model and bundled text (``demo``)."""

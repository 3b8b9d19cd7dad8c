"""``/v1/embeddings``: a padded encoder behind the batcher's batch mode (length-aware, a padded-token budget),
deployed as its own Serve application beside the generation app (see :mod:`serve_app.embeddings.app`)."""

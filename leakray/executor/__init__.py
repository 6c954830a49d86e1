"""The one package that knows Ray: starting or joining it (`runtime`), running batch stages
locally or as Ray Data operators (`batches`), Ray Train worker groups (`train`, `leak_train`),
Ray Tune grids (`tune`) and sandbox actors (`sandbox`). Stages hand in plain callables on
pyarrow batches and never learn where they ran."""

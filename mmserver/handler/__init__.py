"""A model folder made servable, as SageMaker's PyTorch inference toolkit would serve it.

``folder`` resolves a folder (``model.pt``, ``model.pt2``, ``code/inference.py``) once
at load into decode, predict and encode (:class:`~mmserver.handler.folder.ModelHandler`);
``calls`` holds those steps; ``toolkit`` the toolkit's calling convention (the handler
functions and the arguments each is given, in one table); ``user_code`` imports a
model's ``code/`` as its own package; ``requirements`` installs its
``code/requirements.txt`` into a folder of its own.
"""

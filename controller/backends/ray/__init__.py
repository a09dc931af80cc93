"""The ray backend: each Deployment is one named, detached Ray actor that runs its engine.

Imported only when ``--backend ray`` is chosen (``controller.backends.choose``), so
``ray`` is never loaded on the local backend. Modules: ``naming`` (namespaces and actor
names), ``cluster`` (the connection, the GPU inventory, why a spec does not fit),
``actor`` (the actor Ray places on the engine's node), ``hostwords`` (the words of a
status the driver acts on, the node's folder), ``nodeengine`` (the engine's life on its
node, imported there only), ``backend`` (the ``Backend`` protocol).
"""

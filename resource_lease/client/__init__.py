"""A client of the HTTP API that needs no Django: one file of the standard library only
(``lease_client.py``), so it can be copied to a machine that has nothing but Python and run as
``python3 lease_client.py run ...`` (docs/http.md#client). Installed with the package, it is
the ``resource-lease`` command.
"""

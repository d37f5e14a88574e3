"""Where clients come in, above the gateway: one client's connection (a driver of the server session), Bastion's
own stdio, and the HTTP frontend behind ``bastion serve``."""

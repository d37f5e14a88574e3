"""Who is calling: turning one HTTP request's credentials (a bearer token, an API key, a client certificate) into
an ``Identity`` before anything decides. Pure of the gateway and the transports: the HTTP frontend hands a
``Credentials`` in and gets an ``Identity`` or an ``AuthFailure`` back."""

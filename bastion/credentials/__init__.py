"""What Bastion presents to an upstream server: static headers and client certificates, OAuth tokens of its own
(client credentials), and per-user tokens (RFC 8693 token exchange, or a one-time authorization-code flow the user
completes through a link), stored encrypted and refreshed before expiry. Never the caller's own token."""

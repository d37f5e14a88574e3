"""Policy gateway: authorization, argument guards, approval, rate limits and audit."""

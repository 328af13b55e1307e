"""Client connections: login, relay, linking to servers, and who may log in."""

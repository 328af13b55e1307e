"""Sans-IO authentication: SCRAM-SHA-256, md5 and the auth_file."""

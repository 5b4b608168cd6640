"""Who may call a node: the client port's guards (peer protocol, request
signatures, ACLs). Transport security itself is dledger/rpc/tls.py."""

"""The studio's listening socket, bound before anything heavy is imported or loaded: a busy port
is an error at once, not after Gradio's imports and minutes of loading a model.

    sock = bind_socket("127.0.0.1", 7860)    # OSError when the port is taken
    StudioServer(app, host, sock=sock)       # studio.server.serving serves on it
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0 = any free port). OSError when the port is taken:
    the CLI binds before it loads the model, so a busy port is known at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # An explicit IPPROTO_TCP makes asyncio set TCP_NODELAY on accepted connections.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock

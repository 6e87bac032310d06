"""``dsh view``: a read-only local web viewer of a store's sessions (the ``view`` extra).

The transcript a person saw beside the messages the model was sent at any request, compaction
checkpoints with the span they shadow, crash repairs, retries, steering, fork trees and the diff
of two branches, search, raw events by seq and live updates, served by starlette and uvicorn
from the library's public API. ``import dsh`` does not import this package.
"""

from dsh.view._app import create_app
from dsh.view._data import ViewStore
from dsh.view._serve import check_bind, is_loopback, new_token, serve, viewer_url

__all__ = ["ViewStore", "check_bind", "create_app", "is_loopback", "new_token", "serve",
           "viewer_url"]

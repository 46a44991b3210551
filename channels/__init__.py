"""Chat connectors (SPEC section 13) and the webhook intake: what posts into sessions from outside.

``channels/protocol.py`` is the small contract between a connector and the gateway (start with a
post function, render and send a reply, stop; an HTTP-mode connector also takes calls);
``channels/telegram.py`` is the Telegram connector on aiogram 3, ``channels/slack.py`` the Slack
one on slack_sdk (Socket Mode), ``channels/discord.py`` the Discord one on discord.py (the
gateway); ``channels/access.py`` decides who may talk in a direct chat
(``dm_policy``); ``channels/store.py`` keeps the durable outbox and the pairing codes in
``<home>/channels.db``. Nothing here serves HTTP.

``channels/background.py`` is the one "stored → background turn → deliver" path, and
``channels/hooks.py`` the webhook intake on it (typed outcomes; the route renders them): the only
modules here that import the engine (``conversations.turns``); ``channels/webhooks.py`` maps a hook's
payload to a session key and a message (templates, signatures; pure) and ``channels/delivery.py``
POSTs an answer to a hook's ``deliver_to``.
The intake (``channels/intake.py``) wires the connectors to the engine; the gateway builds it.
"""

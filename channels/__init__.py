"""Chat connectors (SPEC section 13): platforms that post into sessions and take replies back.

``channels/protocol.py`` is the small contract between a connector and the gateway (start with a
post function, render and send a reply, stop); ``channels/telegram.py`` is the Telegram connector
on aiogram 3, ``channels/slack.py`` the Slack one on slack_sdk (Socket Mode);
``channels/store.py`` keeps the durable outbox and the pairing codes in ``<home>/channels.db``.
Nothing here serves HTTP or knows the engine: the gateway wires it (``gateway/channel_intake.py``).
"""

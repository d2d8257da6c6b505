"""`python -m webhook_broker_client.cli`: the same as the `webhook-broker` script."""

from webhook_broker_client.cli import main

main()

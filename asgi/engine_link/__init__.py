"""The API worker's side of the engine link: submit and abort, per-request mailboxes, one generation's text deltas."""

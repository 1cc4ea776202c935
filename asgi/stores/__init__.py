"""State kept by the API workers for later requests (stored responses)."""

"""Sans-IO protocols: state machines that take bytes and events and return bytes and events."""

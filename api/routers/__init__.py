"""One router per resource: requests, refs (timelines), kinds (operators), health."""

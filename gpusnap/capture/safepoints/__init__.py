"""Where a snapshot may be taken: frames replay can return to (``returnable``) and the loop
whose boundaries are safe points (``steploop``)."""

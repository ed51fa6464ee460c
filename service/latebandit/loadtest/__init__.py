"""``latebandit loadtest``: a closed-loop HTTP load generator and the traffic mix it drives."""

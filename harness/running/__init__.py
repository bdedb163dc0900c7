"""Running a case: guarded buffers, graph and eager runners, the interpreter address audit, the journal of cases in flight and signal handling."""

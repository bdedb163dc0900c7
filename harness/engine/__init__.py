"""The engine: what runs any contract (the plan, the fuzz loop, the checking worker and its supervisor, jobs,
campaigns, the journal, case files, the generic table check, summaries, repro). It imports no contract."""

-- Models served elsewhere (issue 43): what each variant's fan-out spent per UTC day, against its
-- daily_spend_cap (kept here so that a restart does not reset the day's spend).
CREATE TABLE IF NOT EXISTS fanout_spend (
    experiment TEXT NOT NULL,
    variant TEXT NOT NULL,
    day TEXT NOT NULL,
    spent REAL NOT NULL,
    PRIMARY KEY (experiment, variant, day)
);

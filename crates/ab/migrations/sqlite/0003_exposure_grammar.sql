-- Structured outputs: whether an exposure's answer was constrained by a grammar
-- (response_format or tools) and, when it was, whether it finished as a complete match.
ALTER TABLE exposures ADD COLUMN constrained INTEGER NOT NULL DEFAULT 0;
ALTER TABLE exposures ADD COLUMN grammar_complete INTEGER;

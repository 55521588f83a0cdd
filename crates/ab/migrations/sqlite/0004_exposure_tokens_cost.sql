-- Models served elsewhere (issue 43): the prompt tokens an exposure's answer took and what it
-- cost at its model's configured prices (NULL: no prices, or no answer).
ALTER TABLE exposures ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE exposures ADD COLUMN cost REAL;

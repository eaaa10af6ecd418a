#!/bin/bash
grep warn input.txt > out.txt

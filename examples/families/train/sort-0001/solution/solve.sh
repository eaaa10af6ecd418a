#!/bin/bash
sort records.txt > answer.txt

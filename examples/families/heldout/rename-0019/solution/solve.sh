#!/bin/bash
mv records.txt result.txt
